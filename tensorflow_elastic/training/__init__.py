"""What training scripts call: State objects (commit, restore, sync), the elastic loop
(`tfe.run`), a newcomer's warm-up before it joins (`tfe.warm_up`), Keras `fit` under
membership changes, backups as TensorFlow checkpoints on any
filesystem, and membership changes as TensorBoard scalars.
"""
