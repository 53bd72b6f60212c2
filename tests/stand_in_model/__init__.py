"""A stand-in model, for tests only: what a new model adds to be served, and nothing outside this folder.

spec.py      its `ModelSpec`: a name, its own flag, a plan, an adapter for each service, and its DiT's parts
dit.py       its DiT, from the package's parts: what the conformance suite (tests/conformance) runs it through
adapters.py  the adapters: the services' fakes, carrying the flag's value into their metadata
serve.py     `python -m tests.stand_in_model.serve <telefuser command line>`: registers the spec, runs telefuser
"""
