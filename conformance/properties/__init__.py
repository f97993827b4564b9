"""The property tests (P1-P14), one module per contract item; collected by ``pytest`` from a checkout or with
``pytest --pyargs conformance.properties`` from an installed suite."""
