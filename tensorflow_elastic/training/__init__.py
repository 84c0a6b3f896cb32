"""What training scripts call: State objects (commit, restore, sync), the elastic loop
(`tfe.run`) and Keras `fit` under membership changes.
"""
