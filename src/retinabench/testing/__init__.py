"""Test and demo scaffolding that ships with the package (the demo and the benchmarks need it outside pytest):
raw-layout fixtures of the reference datasets (:mod:`.raw_fixtures`, files from :mod:`.raw_files`), synthetic
metrics tables (:mod:`.synthetic`) and the interfaces demo
(:mod:`.interfaces_demo`). No domain package imports it."""
