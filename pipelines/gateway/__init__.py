"""The OpenAI-compatible gateway the agent calls: the app (`app`), OpenAI request/response types
(`openai_api`), routes and traffic modes (`routes`, `traffic`), streaming (`streaming`), durable capture of
served turns (`capture`) and the live comparison report and gate (`live_report`). It reaches the models only
through Triton's client (`pipelines.serve.client`).
"""
