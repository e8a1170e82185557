"""Inference: the pipeline from a query to its top k labels, and the model-level parts it owns.

    query -> hidden layers -> output top k -> merge over ranks -> fusion -> hidden neighbours

`predict` runs it: the query's rows are normalised and gathered a batch at a
time (dslide.model.inputs), the network's hidden layers run without dropout, the
output layer scores every label of its slice, or what the inference index
retrieves (`index`), each rank's best k are merged (dslide.model.topk), and where
the model keeps a neighbour store its labels are fused in (`fusion`), and where it
keeps hidden neighbours their labels vote (`hidden_knn`).

The parts are the model's, not a layer's: the neighbour store
(`fusion.NeighbourLabels`, a function of the training data) and the
inference index (`index.InferenceIndex`, built from the output layer's final
weights) and the hidden neighbours (`hidden_knn.HiddenNeighbours`); training builds them at its end (dslide.train.infer_build) and
`parts` gives their checkpoint sections. Their math takes arrays; splitting the work over ranks
happens around it, in the functions that take a communicator.
"""
