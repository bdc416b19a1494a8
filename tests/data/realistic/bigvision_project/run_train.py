from bv import train

train.main()
