"""trainctl: submit, watch and stop spot training jobs (docs/reference/trainctl.md)."""
