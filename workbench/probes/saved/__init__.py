"""What the saved files say: adapter weights and targets, tokenizer, config and generation config, read before any
weight is loaded (notebook 00, the pre-flight)."""
