"""PULSELoCo: DiLoCo pseudo-gradients through a BF16-visibility gate, its codec, transports and replicas."""
