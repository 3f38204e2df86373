"""Training programs (thin mains over `train_and_evaluate(config, workdir)`)."""
