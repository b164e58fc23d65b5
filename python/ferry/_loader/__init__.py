"""The machinery of ferry.torch.Loader without a framework (nothing here imports torch at import time),
split by concern as PyTorch splits torch/utils/data/_utils/:

  engine.py     the main process: the shared slots, the first sample that sizes them, the chunks of each
                batch handed out and counted until ferry's prefetcher may copy it
  protocol.py   the messages between the main process and a worker; Note [No chunk is lost]
  worker.py     a worker process: its loop, worker_info(), its seeding, what it does about what it
                inherited; SampleFormat, the part a framework adapter supplies
  processes.py  the workers seen from the main process: start method, start and stop, and what is said
                about one that died, never started or is stuck
  order.py      each epoch's batches of dataset indices and the seed of every sample
  layout.py     where a batch's bytes lie in a slot

A framework adapter (ferry/torch/_loader.py, with ferry/torch/_samples.py) keeps the user's API and makes
the batches into its tensors; the native calls are ferry/_native/loader.py's.
"""
