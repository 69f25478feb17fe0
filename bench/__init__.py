"""Measurement and emulation: the `bench` client (any OpenAI-compatible endpoint), its report,
the emulated vLLM worker, the loopback harness around the real routers, and the benchmark
matrices that write docs/benchmarks.md. `tools/` keeps what operators run against a
deployment; `python -m tools bench` stays the one entry point for the client."""
