"""``llm-bench failover``: a steady load through a LiteLLM proxy while the primary backend is stopped
and started again; what was lost, how soon the fallback answered, how soon the primary took traffic back."""
