"""The OpenAI-compatible gateway the agent calls: the app (`app`), OpenAI request/response types
(`openai_api`), what one request does by its route's mode (`traffic`), the routing table (`router`),
streaming (`streaming`), durable capture of served turns (`capture`) and the projects behind one gateway
(`tenants`). Admission (quotas, fair turns) is `pipelines.admission`; the route modes and the live gate are
`pipelines.livegate`. It reaches the models only through Triton's client (`pipelines.serve.client`).
"""
