import jax


def shifted(w):
    # Differs between devices. It lives in another module: the analysis reads the functions of
    # the step's own module only, where `shifted(w)` of a replicated `w` looks replicated.
    return w + jax.lax.axis_index("batch")
