"""cdk8s charts for the serving layer, and the HyperPod endpoint files that shape them."""
