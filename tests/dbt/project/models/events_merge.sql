-- Load 1: ids 1-4. Load 2: ids 3-5 with new names and a new column (on_schema_change).
{{ config(materialized='incremental', incremental_strategy='merge', unique_key='id',
          on_schema_change='append_new_columns') }}
select id, concat(name, '-{{ var("load") }}') as name, city
{% if var('load') == 2 %}, upper(city) as city_code{% endif %}
from {{ ref('people') }}
{% if is_incremental() %} where id >= 3
union all select 5 as id, 'eve-2' as name, 'rome' as city{% if var('load') == 2 %}, 'ROME' as city_code{% endif %}
{% endif %}
