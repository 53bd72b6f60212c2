"""Device ops used by the models: attention dispatch and rotary embeddings."""
