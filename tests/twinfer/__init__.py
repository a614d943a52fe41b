"""What users import and run: the LLM API, the command line, the shipped trained model and its trainer."""
