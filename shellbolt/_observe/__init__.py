"""What a run shows: the live view's snapshot (``observe``), metrics consumers, rate-limited logs."""
