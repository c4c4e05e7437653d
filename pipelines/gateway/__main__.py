"""`python -m pipelines.gateway`: serve the gateway with uvicorn on the configured loopback address."""

from pipelines.gateway.app import main

main()
