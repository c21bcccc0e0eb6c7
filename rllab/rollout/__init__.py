"""The rollout side: episodes from environments (a task is a one-turn environment), scoring,
the rollout stage that turns them into batches, asynchronous rollouts, evaluation."""
