"""fedrec: federated recommendation and federated bandits."""
