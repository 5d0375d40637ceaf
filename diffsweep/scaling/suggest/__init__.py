"""``diffsweep suggest``: which run narrows the efficiency ratio's CI the most per GPU-hour. The
preposterior analysis (``preposterior``), the candidate runs it prices (``candidates``), and the
command's request and report (``request``); see docs/fits.md, 'Which run next: `diffsweep suggest`'."""
