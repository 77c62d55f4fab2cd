"""Training: the one engine (`engine`: TrainingJob, run_training), its options (`options`),
checkpoints (`checkpoints`), torchrun process set-up (`distributed`), task fine-tuning
(`finetune.train_task`) and continued pretraining (`pretraining`). Import the modules themselves;
this package imports nothing, so the command line starts without torch."""
