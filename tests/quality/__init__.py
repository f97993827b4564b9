"""The suite's own power (by intent): self-tests that show the suite catches what it should.  A planted defect per
property (``test_pNN_meta.py``), the mutants and their seams, a planted defect end to end, the emulation's fidelity
to recordings of the real library, the V1 facades, the kept real runs and recorded data, and adding a property
(``python -m conformance.new_property`` writes its meta-test here).  A folder of its own so that what checks the
suite's power is run and read apart from what checks its code."""
