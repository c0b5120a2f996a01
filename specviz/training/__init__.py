"""Training the drafters: corpora, instruction prompts, distillation and EAGLE."""
