{% snapshot people_snapshot %}
{{ config(target_schema=target.schema, unique_key='id', strategy='check', check_cols=['name']) }}
select id, case when id = 2 and {{ var('load') }} = 2 then 'bobby' else name end as name
from {{ ref('people') }}
{% endsnapshot %}
