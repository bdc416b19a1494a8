"""Write tfds metadata for a synthetic dataset of N examples per split.

`tfds.testing.mock_data(data_dir=...)` takes split sizes from it (flax's own tests read
`.tfds/metadata` from its repository, which a checkout may lack):

    python tfds_metadata.py imagenet2012 <flax>/examples/imagenet/testdata/metadata 16 train,validation
    python tfds_metadata.py lm1b <flax>/examples/lm1b/testdata/metadata 128 train,test
"""

import os
import sys

import tensorflow_datasets as tfds

name, data_dir, count, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
builder = tfds.builder(name, data_dir=data_dir)
splits = [
    tfds.core.SplitInfo(name=n, shard_lengths=[count], num_bytes=0, filename_template=None)
    for n in names.split(",")
]
builder.info.set_splits(tfds.core.SplitDict(splits))
os.makedirs(builder.data_dir, exist_ok=True)
builder.info.write_to_directory(builder.data_dir)
print(builder.data_dir)
