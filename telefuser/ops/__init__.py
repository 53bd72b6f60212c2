"""Device ops used by the models: attention dispatch, rotary embeddings, compiled elementwise chains, FP8 GEMMs."""
