"""A reduced big_vision (2023, before its jit transition), written the way its modules are."""
