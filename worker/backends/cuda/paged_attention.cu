// Placeholder: filled in by the CUDA backend work (issue 10).
