"""Process groups (mesh), cross-rank agreement and the Ulysses communicator."""
