"""Stacks follow deployment lifecycles; each composes constructs and wires object references."""
