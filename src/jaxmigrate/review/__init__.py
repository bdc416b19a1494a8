"""Interactive review's logic: the units a user decides, the keys, the saved progress and the
signal handling (`session`); its terminal rendering is `jaxmigrate.ui.review`."""
