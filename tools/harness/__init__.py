"""What tools and tests both run: Ulysses references and transport cases, the fault matrix, service replicas as
processes and the real servers they need. Tests import it from here; nothing here imports from tests/."""
