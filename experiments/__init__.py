"""Experiment sweeps over configs (Table 3 rows), built on fxformer.train and fxformer.evaluate."""
