"""What the web and file servers read: the run's web cache, documents as text, the reader process."""
