"""Notebook 08: what a Trainer run left behind in its output_dir (trainer_state.json, checkpoint-N/ folders)."""
