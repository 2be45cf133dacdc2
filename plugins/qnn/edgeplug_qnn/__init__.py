"""edgeplug backend plugin for Qualcomm QNN (HTP)."""
