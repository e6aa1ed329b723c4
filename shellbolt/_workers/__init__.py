"""Host workers (Storm's ``topology.workers``): a topology's tasks spread over processes."""
