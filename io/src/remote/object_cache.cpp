// Filled in by the issue 33 work.
