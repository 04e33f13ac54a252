"""Models made here: `demo` is a small Mixtral-shaped MoE trained on the standard library."""
