"""What to launch next: the search space and SGLang's rules on it, the samplers, what earlier
trials already settle or rule out, the warm start and recovery of interrupted trials."""
