"""What a study keeps and shows: the record schema of a trial, storage, artifacts, dashboard
notes, picks, hypervolume, baseline comparison, the report and terminal tables."""
