"""Training-time model code: the typed mini-batch the training step reads (`batch`), packing
trajectories into rows (`packing`), the tree-attention mask that trains a whole tree in one row
(`tree_attention`), the value head (`value_head`)."""
