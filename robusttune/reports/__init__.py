"""``robusttune report`` and the printed figures of the commands: tables and figures of a results
folder (`results`), by axis (`axes`), the Byzantine-majority rounds (`majority`), the aggregation
error (`aggregation`), the spread over seeds (`spread`), robust-tuning studies (`tuning`) and
what ``calibrate`` prints (`calibration`)."""
