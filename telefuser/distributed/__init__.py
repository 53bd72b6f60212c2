"""Process groups (mesh), cross-rank agreement, tensor-parallel styles (tp) and the Ulysses communicator."""
