"""`flywheel bench`: the serving benchmark (base + few-shot against the tuned model through Triton), its report,
AIPerf against the gateway, and synthetic adapters for multi-LoRA benchmarks. The benchmark scripts whose results
the docs render live in the top-level `bench/` folder and call these."""
