"""The Kubernetes operator: admission mutation, failure recovery and resubmission (kopf)."""
