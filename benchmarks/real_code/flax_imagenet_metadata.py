"""Write tfds metadata for a synthetic `imagenet2012` of 16 examples per split.

`tfds.testing.mock_data(data_dir=...)` takes split sizes from it (flax's own test reads
`.tfds/metadata` from its repository, which a checkout may lack):

    python flax_imagenet_metadata.py <flax>/examples/imagenet/testdata/metadata
"""

import os
import sys

import tensorflow_datasets as tfds

builder = tfds.builder("imagenet2012", data_dir=sys.argv[1])
splits = [
    tfds.core.SplitInfo(name=n, shard_lengths=[16], num_bytes=0, filename_template=None)
    for n in ("train", "validation")
]
builder.info.set_splits(tfds.core.SplitDict(splits))
os.makedirs(builder.data_dir, exist_ok=True)
builder.info.write_to_directory(builder.data_dir)
print(builder.data_dir)
