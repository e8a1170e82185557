"""Record the fixture's predictions (top 5, exact and through the inference index) through dslide.Model."""
import json, sys
import dslide
from dslide.comm import Comm
from dslide.io.data import read_xmc
d = sys.argv[1]
model = dslide.Model.load(d, comm=Comm())
X = read_xmc(d + "/queries.txt").X
out = {}
for name, lsh in (("exact", False), ("index", True)):
    ids, scores = model.predict(X, 5, lsh=lsh)
    out[name] = {"ids": ids.tolist(), "scores": [[float(s).hex() for s in r] for r in scores]}
print("{\n" + ",\n".join(f' "{n}": {{"ids": {json.dumps(v["ids"])},\n  "scores": {json.dumps(v["scores"])}}}' for n, v in out.items()) + "\n}")
