"""The embedded local cloud: moto control plane + podman data plane."""
