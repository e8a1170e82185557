"""Studies that chose a past change or a setting no longer default: kept to read, run as `python -m scripts.archive.NAME`.

README.md here says what each studied, where its figures are, and whether it still runs.
"""
