"""The run's configuration: the Hydra schema (`schema`), the method catalog (`methods`), where files are (`paths`)."""
