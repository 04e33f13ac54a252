"""Expert parallel: placement, rebalancing, process group, ranks, weight moves, EP MoE path."""
