"""trainctl: submit, watch and stop spot training jobs (see README)."""
