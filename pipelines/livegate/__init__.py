"""Route modes (serve, shadow, canary) and the live statistical gate that moves a route from the comparisons with the
teacher, with its report."""
