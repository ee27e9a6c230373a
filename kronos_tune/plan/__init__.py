"""`kronos-tune plan`: which parallelism set-up and batch fit each model size on a preset, estimated on fake
tensors (one traced training step per set-up, simulated FSDP ranks, a cache of the traced ops) over the memory
models of kronos_tune.memory and autobatch's training step."""
